"""Integrations of glm5_fastpath into serving engines. Importing this package imports no engine."""
