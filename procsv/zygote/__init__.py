"""The pre-warmed trainer ("zygote") process: imports TensorFlow once, forks trainers on request."""
