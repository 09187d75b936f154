"""The HTTP surface: webhook ingest, the agent API's routes, MCP, OpenAPI, the explorer, health,
and the bounded uvicorn protocol. The application factory is ``kbgraph.api.create_app``."""
