"""The vision-language policy's pieces: synthetic scenes (``scenes``), the built-in tiny VLM (``tiny``)."""
