"""The sweep room: one model planned for many targets, run locally or as Ray tasks."""
