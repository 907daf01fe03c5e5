"""Corpus jobs: many recordings -> JSONL shards, resumable, locally or on Ray (:mod:`~fun_asr.jobs.batch`), and their
evaluation (:mod:`~fun_asr.jobs.evaluate`: WER/CER against references)."""
