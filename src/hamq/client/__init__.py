"""The client: asyncio core (``hamq.aio``) and the sync facade (``hamq``)."""
