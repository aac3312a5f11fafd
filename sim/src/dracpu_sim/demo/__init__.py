"""`dracpu demo`: the whole pipeline on one machine against a simulated node."""
