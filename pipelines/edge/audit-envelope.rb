version=2
# FleetSight audit log envelopes: generated from pipelines/catalogue.py by `fleetsight logs generate`.
rule=syslog_iso:%{"name": "f__tmp_ts", "type": "date-rfc5424"}% %{"name": "f__tmp_host", "type": "word"}% %{"name": "f__tmp_body", "type": "rest"}%
rule=syslog_bsd:%{"name": "f__tmp_ts", "type": "date-rfc3164"}% %{"name": "f__tmp_host", "type": "word"}% %{"name": "f__tmp_body", "type": "rest"}%
