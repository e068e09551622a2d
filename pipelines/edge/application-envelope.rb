version=2
# FleetSight application log envelopes: generated from pipelines/catalogue.py by `fleetsight logs generate`.
rule=bracketed:[%{"name": "f__tmp_date", "type": "date-iso"}% %{"name": "f__tmp_time", "type": "time-24hr"}%] %{"name": "f__tmp_body", "type": "rest"}%
rule=iso:%{"name": "f__tmp_ts", "type": "date-rfc5424"}% %{"name": "f__tmp_body", "type": "rest"}%
rule=plain:%{"name": "f__tmp_date", "type": "date-iso"}% %{"name": "f__tmp_time", "type": "time-24hr"}% %{"name": "f__tmp_body", "type": "rest"}%
