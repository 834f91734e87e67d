"""The summary service process: writes TensorBoard event files from the trainer's summaries."""
