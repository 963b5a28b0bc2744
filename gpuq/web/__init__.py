"""The coordinator's HTTP side: the metrics endpoint's and the web dashboard's server."""
