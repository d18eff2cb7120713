"""``evaluate --video``: one episode of a trained policy drawn frame by frame from the
environment's state (with PIL, which matplotlib brings) into an animated GIF or an
H.264 MP4 (with PyAV, FFmpeg's bindings), at the environment's own pace. gymnax draws
its classic-control environments through Gymnasium's renderer, which needs pygame;
these few lines need nothing more. Any other environment whose family declares
``Capabilities.renders`` draws its own frames (``Env.render``), at its ``frame_seconds``
a step, an episode drawn for at most ``MAX_STEPS`` steps."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from jaxrl_frag.app.evaluation import Trained, record_episode
from jaxrl_frag.app.rundir import check_output
from jaxrl_frag.errors import check
from jaxrl_frag.writes import write_atomically

SIZE = (400, 240)  # frame width and height in pixels
INK, CART, POLE = (40, 40, 40), (60, 110, 180), (200, 120, 50)
MAX_STEPS = 1000  # the most steps of an episode that a family's own frames draw (Craftax's last 10,000)


def _cartpole(state: Any, params: Any) -> Image.Image:
    """The cart on its track and the pole at its angle (upright at 0)."""
    width, height = SIZE
    scale = width / (2 * 1.25 * float(params.x_threshold))  # the track, and a margin either side
    x, theta = width / 2 + float(state.x) * scale, float(state.theta)
    ground, pole = height * 0.7, 2 * float(params.length) * scale
    image = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(image)
    draw.line([(0, ground + 12), (width, ground + 12)], fill=INK, width=1)
    draw.rectangle([x - 24, ground - 12, x + 24, ground + 12], fill=CART)
    draw.line([(x, ground), (x + pole * np.sin(theta), ground - pole * np.cos(theta))], fill=POLE, width=7)
    return image


def _pendulum(state: Any, params: Any) -> Image.Image:
    """The pendulum about its pivot (upright at 0)."""
    width, height = SIZE
    cx, cy, rod = width / 2, height / 2, height * 0.4
    theta = float(state.theta)
    image = Image.new("RGB", SIZE, "white")
    draw = ImageDraw.Draw(image)
    draw.line([(cx, cy), (cx + rod * np.sin(theta), cy - rod * np.cos(theta))], fill=POLE, width=9)
    draw.ellipse([cx - 5, cy - 5, cx + 5, cy + 5], fill=INK)
    return image


# environment id -> (the frame of a state, the seconds a step lasts), both from the environment's parameters too
RENDERERS: dict[str, tuple[Callable[[Any, Any], Image.Image], Callable[[Any], float]]] = {
    "CartPole-v1": (_cartpole, lambda params: float(params.tau)),
    "Pendulum-v1": (_pendulum, lambda params: float(params.dt)),
}


# the files --video writes, by suffix: what such a file's first bytes hold (an existing one is replaced only if they do)
FORMATS: dict[str, Callable[[bytes], bool]] = {".gif": lambda head: head[:4] == b"GIF8",
                                               ".mp4": lambda head: head[4:8] == b"ftyp"}


def check_video(path: Path, env_id: str) -> None:
    """Raise ``ConfigError`` unless an episode of ``env_id`` can be drawn into ``path``, a
    GIF or an MP4 (an existing file there is replaced only if it is one of that kind)."""
    kind = path.suffix.lower()
    check(kind in FORMATS, "video", str(path), "writes an animated GIF or an MP4: give a path ending in .gif or .mp4")
    check(_renderer(env_id) is not None or _renders(env_id), "video", str(path),
          f"the environment {env_id} cannot be drawn; --video draws {', '.join(RENDERERS)} and the families that "
          "render (Capabilities.renders): drop --video")
    check_output("video", path)
    check(not path.exists() or (path.is_file() and FORMATS[kind](path.read_bytes()[:8])), "video", str(path),
          f"exists and is not {'a GIF' if kind == '.gif' else 'an MP4'}, which --video would replace: give another path")


def write_video(trained: Trained, path: Path, greedy: bool, seed: int) -> tuple[int, float]:
    """Draw one episode of ``trained``'s policy into ``path`` (``check_video`` first), whole
    or not at all (``WriteError`` naming ``path``); returns its length and return."""
    from jaxrl_frag import envs

    env_id = trained.recipe.env.name
    env = envs.make(env_id)
    if (renderer := _renderer(env_id)) is not None:
        draw, seconds = renderer
        params = env.params
        states, rewards = record_episode(trained, greedy, seed, int(params.max_steps_in_episode))
        frames = [draw(_at(states, t), params) for t in range(len(rewards))]
        step_seconds = seconds(params)
    else:  # the family draws its own frames
        states, rewards = record_episode(trained, greedy, seed, min(getattr(env, "max_steps", None) or MAX_STEPS,
                                                                    MAX_STEPS))
        frames = [_framed(Image.fromarray(pixels)) for pixels in env.render(states)]
        step_seconds = env.frame_seconds
    for t, (frame, total) in enumerate(zip(frames, np.cumsum(rewards), strict=True)):
        ImageDraw.Draw(frame).text((8, 8), f"{env_id}  step {t + 1}  return {total:.1f}", fill=INK)

    def write(tmp: Path) -> None:
        if path.suffix.lower() == ".gif":
            frames[0].save(tmp, format="GIF", save_all=True, append_images=frames[1:],
                           duration=round(1000 * step_seconds), loop=0)
        else:
            _mp4(frames, tmp, Fraction(1 / step_seconds).limit_denominator(1000))

    write_atomically(path, write)
    return len(frames), float(np.sum(rewards))


def _renderer(env_id: str) -> tuple[Callable[[Any, Any], Image.Image], Callable[[Any], float]] | None:
    """The renderer of ``env_id``'s environment, its options aside (``CartPole-v1@obs=0,2`` is
    CartPole, whose state the mask leaves whole); ``None`` where ``RENDERERS`` has none."""
    from jaxrl_frag.envs import base_id

    return RENDERERS.get(base_id(env_id))


def _renders(env_id: str) -> bool:
    """Whether the family of ``env_id`` draws its own frames (an unknown id: ``ConfigError``)."""
    from jaxrl_frag import envs

    return envs.make(env_id).capabilities.renders


def _framed(image: Image.Image) -> Image.Image:
    """``image`` scaled to fit ``SIZE`` whole (nearest pixels) and centred on white, with room for the caption."""
    width, height = SIZE
    scale = min(width / image.width, (height - 24) / image.height)
    image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.NEAREST)
    frame = Image.new("RGB", SIZE, "white")
    frame.paste(image, ((width - image.width) // 2, 24 + (height - 24 - image.height) // 2))
    return frame


def _mp4(frames: list[Image.Image], path: Path, rate: Fraction) -> None:
    """``frames`` at ``rate`` per second into an H.264 MP4 at ``path``."""
    import av

    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("h264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = *SIZE, "yuv420p"
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_image(frame)))
        out.mux(stream.encode())


def _at(states: Any, t: int) -> Any:
    """Step ``t`` of states stacked on a leading axis."""
    import jax

    return jax.tree.map(lambda x: x[t], states)
