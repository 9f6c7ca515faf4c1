"""Database writes and reads that the ORM makes too slow on the hot paths, each justified by the
bench named in its docstring: bulk writes in one statement (`bulk`), prepared statements and
rows of written-out SQL (`sql`)."""
