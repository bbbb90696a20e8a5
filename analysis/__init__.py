"""Reads commbench result files only: plots, CSV export, cost model, timeline, report."""
