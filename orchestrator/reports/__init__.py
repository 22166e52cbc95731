"""The report room: views of a Plan (table, JSON, Markdown, HTML, Model Explorer overlay) and
the plan JSON schema.

It owns presentation only; every figure it prints comes from orchestrator.planning.
"""
