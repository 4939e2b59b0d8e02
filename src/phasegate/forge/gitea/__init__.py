"""The Gitea forge (Forgejo alike): REST API v1 over httpx, its token, git over HTTPS, CI."""
