"""NRI plugin side of dracpu.

`mux` and `ttrpc` are sans-IO codecs for the runtime socket (protocols.md 5 and 6): one
`Multiplexer` splits the socket into logical connection 1 (a `TTRPCServerConnection` serving
`nri.pkg.api.v1alpha1.Plugin`) and connection 2 (a `TTRPCClientConnection` calling
`nri.pkg.api.v1alpha1.Runtime`). A Trio shell feeds socket bytes to the multiplexer, hands each
`MuxData` payload to the ttrpc object of its connection, and writes back what they queue.
"""
