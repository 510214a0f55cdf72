"""What to chart, as data: pure functions of a snapshot and the page's options, and their memo per snapshot."""
