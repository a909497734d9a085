"""The HTTP room (service/http) on real servers and raw sockets: connection limits, parser processes, budget, operations, end to end."""
