"""Network "restricted": the forward proxy (Squid) run by the server, its rules, network and
firewall, connection bounds, access log and byte meter.
"""
