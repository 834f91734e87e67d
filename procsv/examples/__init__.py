"""Built-in example training programs (run them with ``procsv launch procsv.examples.NAME``)."""
