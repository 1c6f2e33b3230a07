"""Importers of memory folders written by other memory servers (the reference N.E.K.O.)."""
