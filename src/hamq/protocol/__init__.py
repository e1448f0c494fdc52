"""Sans-IO wire protocol: frames, codes, the message and record codecs. Never imports asyncio."""
