"""The decoding loop over loaded models: ``engine`` (the round: propose -> score -> process -> verify -> commit ->
stop -> metrics), ``scheduler`` (the one queue: admission, cancel, callbacks) and ``text`` (stop strings and
streamed text)."""
