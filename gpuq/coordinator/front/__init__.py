"""The one front door: QueueQueries and QueueCommands answer callers (the caller resolved once,
by rpc_calls' interceptor) in the wire's messages; the gRPC servicers are thin over them, and
the dashboard (gpuq.web.queue_access) calls the same methods."""
