"""Code the bench scripts share (a package, so ``make bench``'s ``bench/*.py`` loop does not
run it as a bench)."""
