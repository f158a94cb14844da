"""The OpenAI-compatible HTTP layer (aiohttp): validation, routes, SSE, errors; no model math here."""
