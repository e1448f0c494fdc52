"""The asyncio shell: connections, servers, request multiplexing, the event loop."""
