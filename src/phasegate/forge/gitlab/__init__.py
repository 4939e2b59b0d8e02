"""The GitLab forge: a GitLab project (gitlab.com or self-hosted) behind the Forge protocol."""
