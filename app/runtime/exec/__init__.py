"""Commands in a running container: docker exec and the in-container executor (its protocol,
sessions and agent), process trees, kills, output streams.
"""
