ALTER TABLE {database}.measurements ADD COLUMN sample_rate Float64 DEFAULT 1
