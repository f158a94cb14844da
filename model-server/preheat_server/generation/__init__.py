"""The request path outside the engine: text in, text out (no HTTP, no model math).

`service.GenerationService` tokenizes and checks a request, runs it through `async_engine.AsyncEngine`
(the engine's thread, bridged to asyncio), turns token bytes into text with `text_stream.TextStream`
and answers repeated greedy requests from `completion_cache.CompletionCache`.
"""
