"""A thin async Kubernetes API layer (httpx): discovery, the /scale writer's transport and leader election."""
