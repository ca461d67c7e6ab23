"""Case handling between the UI and the inference service: the film, the conversation, the report."""
