"""The coordinator's HTTP side: the metrics port's and the web dashboard's server, on aiohttp in
the coordinator's event loop (http_endpoint, with connection_guard's limits; handlers take and
give the plain http_types), the dashboard (dashboard: routes and rules; dashboard_api: its JSON;
event_feed: live updates; static_files; sessions), and queue_access, the one place
the dashboard reaches into the coordinator."""
