"""The test rig: the fake GitHub and its validating proxy, the kill-torture harness,
PostgreSQL, browser and model helpers, and a real OpenID Connect provider."""
