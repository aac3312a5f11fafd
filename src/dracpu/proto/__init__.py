"""The project's own .proto sources and the modules generated from them.

Regenerate with ``make proto`` (tools/gen_proto.py); ``make proto-check`` fails when the
committed modules drift from the sources. Import paths follow the directory layout:
``dracpu.proto.dra.v1.api_pb2``, ``dracpu.proto.pluginregistration.api_grpc``, ...
"""
