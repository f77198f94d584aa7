"""Campaigns: plan files into cases, the runner, shards, parallel jobs, adaptive repetitions, calibration and lab check."""
