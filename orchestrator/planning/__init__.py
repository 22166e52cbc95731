"""The plan room: the Plan data model (one OpPlacement per op plus the hidden CPU work), its
costs and summary, the CI gates, cost placement and the model-structure grouping.

It owns what a placement is and what it costs; how a Plan is shown lives in orchestrator.reports.
"""
