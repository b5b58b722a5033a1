"""Reading run directories after the fact: `ablate compare` (tables, intervals, plots, report.html)
and `ablate ls`. Imports neither torch nor transformers: works on a laptop over synced outputs."""
