"""The plan model: what a worker needs of a planned job (stages, steps, sender ids), with no import of streamz."""
