"""fp16 loss scaling: static, or dynamic with hysteresis (DeepSpeed's semantics, our code).

Dynamic: start at ``2**initial_scale_power``. A step whose gradients overflowed on *any* rank
is skipped on every rank (the engine all-reduces the overflow flag first) and, once
``hysteresis`` overflows have been tolerated, halves the scale (never below
``min_loss_scale``). After ``loss_scale_window`` steps in a row without overflow the scale
doubles. Example, defaults (2**16, window 1000, hysteresis 2): overflow at step 10 keeps 65536
(hysteresis 2 -> 1), a second at step 11 halves to 32768; steps 12..1011 clean -> 65536 again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from commlayer.zero.config import FP16Config

__all__ = ["LossScaler"]


@dataclass(frozen=True)
class LossScaler:
    scale: float
    dynamic: bool
    window: int
    hysteresis: int
    consecutive_hysteresis: bool
    min_scale: float
    tolerance_left: int  # overflows still tolerated before the scale drops
    clean_steps: int  # steps since the last overflow or scale change

    @classmethod
    def disabled(cls) -> LossScaler:
        return cls(1.0, False, 1, 1, False, 1.0, 1, 0)

    @classmethod
    def from_config(cls, config: FP16Config) -> LossScaler:
        if not config.enabled:
            return cls.disabled()
        if not config.dynamic:
            return cls(config.loss_scale, False, 1, 1, False, 1.0, 1, 0)
        return cls(
            float(2**config.initial_scale_power),
            True,
            config.loss_scale_window,
            config.hysteresis,
            config.consecutive_hysteresis,
            config.min_loss_scale,
            config.hysteresis,
            0,
        )

    def update(self, overflow: bool) -> LossScaler:
        """The scaler for the next step, after one with (or without) an overflow."""
        if not self.dynamic:
            return self
        if overflow:
            if self.tolerance_left > 1:
                return replace(self, tolerance_left=self.tolerance_left - 1, clean_steps=0)
            return replace(self, scale=max(self.scale / 2, self.min_scale), clean_steps=0)
        clean = self.clean_steps + 1
        tolerance = self.hysteresis if self.consecutive_hysteresis else self.tolerance_left
        if clean % self.window == 0:
            return replace(self, scale=self.scale * 2, clean_steps=0, tolerance_left=self.hysteresis)
        return replace(self, clean_steps=clean, tolerance_left=tolerance)

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "tolerance_left": self.tolerance_left, "clean_steps": self.clean_steps}

    def with_state(self, state: dict[str, Any]) -> LossScaler:
        return replace(
            self,
            scale=float(state["scale"]),
            tolerance_left=int(state["tolerance_left"]),
            clean_steps=int(state["clean_steps"]),
        )
