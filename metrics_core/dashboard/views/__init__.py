"""What to chart, as data: pure functions of a snapshot and the page's options (the specs the figures
draw), and what of them is memoised per snapshot."""
