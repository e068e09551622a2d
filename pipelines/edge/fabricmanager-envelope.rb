version=2
# FleetSight fabricmanager log envelopes: generated from pipelines/catalogue.py by `fleetsight logs generate`.
rule=fm_line:[%{"name": "f__tmp_fmtime", "type": "char-to", "extradata": "]"}%] [%{"name": "f__tmp_level", "type": "char-to", "extradata": "]"}%] [tid %{"name": "f_process_thread_id", "type": "number", "format": "number"}%] %{"name": "f__tmp_body", "type": "rest"}%
