version=2
# FleetSight kernel log envelopes: generated from pipelines/catalogue.py by `fleetsight logs generate`.
rule=syslog_iso:%{"name": "f__tmp_ts", "type": "date-rfc5424"}% %{"name": "f__tmp_host", "type": "word"}% kernel: [%{"name": "f_fleetsight_uptime_s", "type": "float"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=syslog_iso:%{"name": "f__tmp_ts", "type": "date-rfc5424"}% %{"name": "f__tmp_host", "type": "word"}% kernel: [%{"name": "-", "type": "whitespace"}%%{"name": "f_fleetsight_uptime_s", "type": "float"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=syslog_iso:%{"name": "f__tmp_ts", "type": "date-rfc5424"}% %{"name": "f__tmp_host", "type": "word"}% kernel: %{"name": "f__tmp_body", "type": "rest"}%
rule=syslog_bsd:%{"name": "f__tmp_ts", "type": "date-rfc3164"}% %{"name": "f__tmp_host", "type": "word"}% kernel: [%{"name": "f_fleetsight_uptime_s", "type": "float"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=syslog_bsd:%{"name": "f__tmp_ts", "type": "date-rfc3164"}% %{"name": "f__tmp_host", "type": "word"}% kernel: [%{"name": "-", "type": "whitespace"}%%{"name": "f_fleetsight_uptime_s", "type": "float"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=syslog_bsd:%{"name": "f__tmp_ts", "type": "date-rfc3164"}% %{"name": "f__tmp_host", "type": "word"}% kernel: %{"name": "f__tmp_body", "type": "rest"}%
rule=dmesg:[%{"name": "f_fleetsight_uptime_s", "type": "float"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=dmesg:[%{"name": "-", "type": "whitespace"}%%{"name": "f_fleetsight_uptime_s", "type": "float"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=dmesg_ctime:[%{"name": "-", "type": "alpha"}% %{"name": "f__tmp_ctime", "type": "char-to", "extradata": "]"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=bare_kernel:kernel: %{"name": "f__tmp_body", "type": "rest"}%
