"""`pipe check` (`stage`) and the checks behind it: one small function per check, grouped by the folder they read.

* `stage`: recognise each folder, load it once, run its checks; `policy`: thresholds and severities.
* `registry`: every check, declared once where it is written (`@check("shard")`): kind, name,
  default severity, description; the stage, the policy and the policy's schema read it.
* `result`: `CheckResult` (name, severity, pass/fail/skip, message, numbers, examples).
* `clean_dir`: checks on a CLEAN_DIR (manifest.parquet, report.json, data/).
* `shard_dir`: checks on a SHARD_DIR (index.json, the tar shards), read by `tarscan`.
* `content`: what one output file's bytes say (image header/pixels, text encoding).
* `classes`: samples per class and imbalance, for both kinds.
* `leakage`: exact and near duplicates shared between train and val, without comparing all pairs.
* `junit`: the report as JUnit XML for CI systems.
"""
