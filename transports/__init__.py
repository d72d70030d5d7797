"""How bytes move between ranks. Algorithms see only `transports.base.Transport`."""
