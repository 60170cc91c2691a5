"""knobkeeper: deploy a PD-disaggregated LLM serving stack and keep every knob change in git."""

__version__ = "0.1.0"
