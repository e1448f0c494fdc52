"""The management plane over HTTP: RabbitMQ's management API shapes where RabbitMQ has the
resource, RocketMQ's dashboard resources for the rest, and the web console; FastAPI
generates the OpenAPI schema from the typed models."""
