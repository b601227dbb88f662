"""Synthetic GUI screens and the one-step action grammar of the GUI tasks (``policies/vision_language/tasks_gui.py``).

A **screen** (:func:`gui_screen`, scene kind ``gui``) is a 32 × 32 RGB canvas (``scenes.SIZE``, background
``scenes.BACKGROUND``) with 2–4 filled buttons of distinct colours (``scenes.COLOURS``; 6–10 px wide, 4–6 px
high) and, on half of the screens, one text field drawn as a 1-px light-grey outlined box (12–18 × 5–7 px); the
elements do not touch (a 1-px gap). Each element has a ``kind`` (``button`` / ``field``), a ``colour`` (the
field's is ``"grey"``), a ``box`` ``[x1, y1, x2, y2]`` (corners included) and a ``mask``. Every screen carries one
instruction: ``Tap the <colour> button.`` (action type ``click``, the target a button) or, on screens with a
field and with probability 0.4, ``Type '<word>' in the field.`` (action type ``type``, the word from
:data:`WORDS`). ``difficulty`` is the number of elements on the screen (2–5): the more buttons, the more
distractors the policy must look past. A screen is a pure function of its seed
(``numpy.random.default_rng([SCENES_VERSION, GUI_KIND_ID, seed])``).

The critic's case (:func:`critic_case`, scene kind ``gui_marked``): the same screen plus a *proposed* action drawn
from its own stream (``default_rng([SCENES_VERSION, CRITIC_KIND_ID, seed])``): correct with probability ½ (a
click at a uniform pixel of the target, or the right word typed), else one of the wrong kinds that apply (a click
inside another element, a click on the background, the wrong word typed, the wrong action type). As GUI-Critic-R1's
screenshots mark the interaction area with a red circle, the ``gui_marked`` picture draws a white plus (5 px) at a
proposed click.

**Action grammar** (one action, no spaces needed): ``click(x,y)`` with non-negative integer pixel coordinates
(``x`` to the right, ``y`` down; spaces around the numbers allowed) or ``type(text)`` with non-empty text (stripped;
everything up to the last ``)``). :func:`parse_action` returns ``("click", x, y)``, ``("type", text)`` or None
(anything else: a negative or fractional number, an empty text, other words, trailing text).
:func:`action_correct` decides whether an action does what the instruction asks: same type, and the click inside
the target's box (corners included) or the typed text equal to the word.

Provenance: grpolab's own — toy GUI screens and an action grammar for the GUI-Critic-R1 (seed 000-121) and
CRAFT-GUI (seed 000-19) tasks; the papers use real phone/web screenshots and Qwen2.5-VL action formats.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from .scenes import BACKGROUND, COLOURS, SCENES_VERSION, SIZE, box_mask, register_scene

GUI_KIND_ID = 121        # the screen's stream (seed 000-121's number, distinct from the shapes scenes' 1)
CRITIC_KIND_ID = 122     # the proposed action's stream
FIELD_COLOUR = (200, 200, 200)
MARKER_COLOUR = (255, 255, 255)
WORDS = ("hi", "ok", "yes", "no", "go", "cat")
BUTTON_W, BUTTON_H = (6, 10), (4, 6)
FIELD_W, FIELD_H = (12, 18), (5, 7)
P_TYPE = 0.4

Action = tuple  # ("click", x, y) or ("type", text)


@dataclass
class GuiElement:
    kind: str               # "button" or "field"
    colour: str             # a COLOURS name; "grey" for the field
    box: list[int]          # [x1, y1, x2, y2], inclusive
    mask: np.ndarray        # bool [SIZE, SIZE]

    @property
    def name(self) -> str:
        return "field" if self.kind == "field" else f"{self.colour} button"


@dataclass
class GuiScreen:
    image: np.ndarray               # uint8 [SIZE, SIZE, 3]
    elements: list[GuiElement]
    target: int                     # index into elements
    action_type: str                # "click" or "type"
    text: str = ""                  # the word to type ("" for a click)
    extra: dict = field(default_factory=dict)

    @property
    def instruction(self) -> str:
        if self.action_type == "type":
            return f"Type '{self.text}' in the field."
        return f"Tap the {self.elements[self.target].colour} button."

    @property
    def difficulty(self) -> int:
        return len(self.elements)

    def answer(self) -> Action:
        """The canonical correct action: a click at the target's centre (rounded down) or the word typed."""
        if self.action_type == "type":
            return ("type", self.text)
        x1, y1, x2, y2 = self.elements[self.target].box
        return ("click", (x1 + x2) // 2, (y1 + y2) // 2)


def _touches(box, boxes, gap: int = 1) -> bool:
    return any(not (box[2] + gap < b[0] or b[2] + gap < box[0] or box[3] + gap < b[1] or b[3] + gap < box[1])
               for b in boxes)


def _place(rng: np.random.Generator, w_range, h_range, taken: list) -> list[int]:
    for _ in range(500):
        w = int(rng.integers(w_range[0], w_range[1] + 1))
        h = int(rng.integers(h_range[0], h_range[1] + 1))
        x1 = int(rng.integers(0, SIZE - w + 1))
        y1 = int(rng.integers(0, SIZE - h + 1))
        box = [x1, y1, x1 + w - 1, y1 + h - 1]
        if not _touches(box, taken):
            return box
    raise RuntimeError("could not place the GUI elements")  # pragma: no cover - 5 small boxes always fit


def field_mask(box) -> np.ndarray:
    """The 1-px outline of ``box`` (the field is drawn as an outlined box; its inside stays background)."""
    outer = box_mask(box)
    x1, y1, x2, y2 = box
    return outer & ~box_mask([x1 + 1, y1 + 1, x2 - 1, y2 - 1])


def paint_screen(elements: list[GuiElement]) -> np.ndarray:
    img = np.empty((SIZE, SIZE, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    for e in elements:
        img[e.mask] = FIELD_COLOUR if e.kind == "field" else COLOURS[e.colour]
    return img


def gui_screen(seed: int) -> GuiScreen:
    """The screen of ``seed`` (module docstring). Pure function of ``seed``."""
    rng = np.random.default_rng([SCENES_VERSION, GUI_KIND_ID, int(seed)])
    names = list(COLOURS)
    n_buttons = int(rng.integers(2, 5))
    colours = [names[int(i)] for i in rng.choice(len(names), size=n_buttons, replace=False)]
    has_field = bool(rng.random() < 0.5)
    elements: list[GuiElement] = []
    if has_field:  # the largest element first
        box = _place(rng, FIELD_W, FIELD_H, [])
        elements.append(GuiElement("field", "grey", box, field_mask(box)))
    for c in colours:
        box = _place(rng, BUTTON_W, BUTTON_H, [e.box for e in elements])
        elements.append(GuiElement("button", c, box, box_mask(box)))
    buttons = [i for i, e in enumerate(elements) if e.kind == "button"]
    if has_field and rng.random() < P_TYPE:
        target, action_type, text = 0, "type", WORDS[int(rng.integers(0, len(WORDS)))]
    else:
        target, action_type, text = buttons[int(rng.integers(0, len(buttons)))], "click", ""
    return GuiScreen(paint_screen(elements), elements, target, action_type, text)


register_scene("gui", gui_screen)


# ----------------------------------------------------------------------------- the action grammar

_CLICK = re.compile(r"click\(\s*(\d+)\s*,\s*(\d+)\s*\)")
_TYPE = re.compile(r"type\((.*)\)", re.S)


def parse_action(text) -> Action | None:
    """``("click", x, y)``, ``("type", text)`` or None for one action written in the grammar (module docstring);
    whitespace around the action is ignored."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    m = _CLICK.fullmatch(s)
    if m:
        return ("click", int(m.group(1)), int(m.group(2)))
    m = _TYPE.fullmatch(s)
    if m and m.group(1).strip():
        return ("type", m.group(1).strip())
    return None


def format_action(action: Action) -> str:
    """The grammar's text of ``action`` (the inverse of :func:`parse_action`)."""
    if action[0] == "click":
        return f"click({int(action[1])},{int(action[2])})"
    return f"type({action[1]})"


def inside(x: int, y: int, box) -> bool:
    """Whether pixel (x, y) lies in ``box`` ``[x1, y1, x2, y2]`` (corners included)."""
    x1, y1, x2, y2 = (int(v) for v in box)
    return x1 <= int(x) <= x2 and y1 <= int(y) <= y2


def action_correct(action: Action | None, action_type: str, target_box=None, target_text: str = "") -> bool:
    """Whether ``action`` does what the instruction asks: the asked type, and a click inside ``target_box`` or the
    typed text equal to ``target_text``."""
    if action is None or action[0] != action_type:
        return False
    if action_type == "click":
        return target_box is not None and inside(action[1], action[2], target_box)
    return action[1] == str(target_text)


# ----------------------------------------------------------------------------- the critic's proposed action

@dataclass
class CriticCase:
    screen: GuiScreen
    proposed: Action
    label: str               # "Correct" or "Incorrect" (the authors' evaluation parses these words)
    error: str = ""          # the wrong kind: "other_element", "background", "wrong_text", "wrong_type"

    @property
    def image(self) -> np.ndarray:
        """The screen with a white plus at a proposed click (GUI-Critic-R1's red circle on the action area)."""
        img = self.screen.image.copy()
        if self.proposed[0] == "click":
            x, y = int(self.proposed[1]), int(self.proposed[2])
            for dx, dy in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
                if 0 <= x + dx < SIZE and 0 <= y + dy < SIZE:
                    img[y + dy, x + dx] = MARKER_COLOUR
        return img


def _uniform_pixel(rng, box) -> tuple[int, int]:
    x1, y1, x2, y2 = box
    return int(rng.integers(x1, x2 + 1)), int(rng.integers(y1, y2 + 1))


def critic_case(seed: int) -> CriticCase:
    """Screen ``seed`` with a proposed action, correct with probability ½ (module docstring). Pure function of
    ``seed``."""
    screen = gui_screen(seed)
    rng = np.random.default_rng([SCENES_VERSION, CRITIC_KIND_ID, int(seed)])
    tgt = screen.elements[screen.target]
    if rng.random() < 0.5:
        if screen.action_type == "type":
            return CriticCase(screen, ("type", screen.text), "Correct")
        return CriticCase(screen, ("click", *_uniform_pixel(rng, tgt.box)), "Correct")
    others = [e for i, e in enumerate(screen.elements) if i != screen.target]
    kinds = ["other_element", "background"] + (["wrong_text", "wrong_type"] if screen.action_type == "type"
                                               else ["wrong_type"])
    if screen.action_type == "type":
        kinds.remove("other_element")  # a click anywhere is already the wrong type; keep one click kind
        others = []
    error = kinds[int(rng.integers(0, len(kinds)))]
    if error == "other_element":
        e = others[int(rng.integers(0, len(others)))]
        proposed = ("click", *_uniform_pixel(rng, e.box))
    elif error == "background":
        covered = np.zeros((SIZE, SIZE), dtype=bool)
        for e in screen.elements:
            covered |= box_mask(e.box)
        ys, xs = np.nonzero(~covered)
        k = int(rng.integers(0, len(xs)))
        proposed = ("click", int(xs[k]), int(ys[k]))
    elif error == "wrong_text":
        words = [w for w in WORDS if w != screen.text]
        proposed = ("type", words[int(rng.integers(0, len(words)))])
    else:  # wrong_type
        if screen.action_type == "type":
            b = [e for e in screen.elements if e.kind == "button"]
            proposed = ("click", *_uniform_pixel(rng, b[int(rng.integers(0, len(b)))].box))
        else:
            proposed = ("type", WORDS[int(rng.integers(0, len(WORDS)))])
    return CriticCase(screen, proposed, "Incorrect", error)


register_scene("gui_marked", critic_case)


def describe_screen(screen: GuiScreen) -> str:
    """A text description of the screen's elements (what a text-only judge reads in place of the picture):
    ``"blue button [3,4,10,9]; field [12,20,27,26]"``."""
    return "; ".join("{} [{},{},{},{}]".format(e.name, *e.box) for e in screen.elements)
