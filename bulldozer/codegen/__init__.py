"""Client libraries generated from a job's schema: Python (``python``), Java and Go
(``native``); their templates live in ``templates/`` beside them."""
