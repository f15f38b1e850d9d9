"""The decoding core: the step-event protocol, the verification engine and the one decoding loop. It knows no method."""
