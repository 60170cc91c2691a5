"""The real engine's contract, checked against the version an inventory pins: launch flags through
sglang's own argument parser (run in a cached side environment) and the prefill/decode pairing
invariants from the parsed arguments. Sits beside knobkeeper.deploy (it reads rendered commands);
the variable registry itself is knobkeeper.knobs.registry."""
