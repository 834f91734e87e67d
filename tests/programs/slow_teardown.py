"""A program that ends at once but whose interpreter takes seconds to tear down (a module-level object
with a slow ``__del__``, as TensorFlow's own teardown takes 1.7 s here): it says ``tearing down`` on
stderr when that starts."""

import logging
import sys
import time


class Teardown:
    def __del__(self) -> None:
        sys.stderr.write("tearing down\n")
        sys.stderr.flush()
        time.sleep(3.0)


logging._procsv_test_teardown = Teardown()  # type: ignore[attr-defined]  # freed with the modules, at the end
print("done", flush=True)
