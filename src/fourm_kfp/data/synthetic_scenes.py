"""Synthetic 3-D scenes ray-cast into seven exactly aligned modalities: the embedded default dataset.

A scene is a ground plane (a disc, y = 0 in a y-up world) with one to four primitives resting on it — spheres,
cubes (turned about the vertical axis), vertical cylinders and cones in several colours and sizes — a pinhole
camera looking slightly down at them and a directional light. :func:`render_scene` ray-casts it in vectorised
NumPy (one ray through each pixel centre, no antialiasing) to the modalities of :mod:`.modalities`:

* ``rgb`` — Lambertian + ambient + a soft specular highlight, shadow rays to the light, a checkered ground and
  a sky gradient;
* ``depth`` / ``normal`` — the exact camera z-depth and analytic surface normal (camera frame) of the first hit;
* ``semseg`` — the class id of the hit surface; ``edge`` — where the hit object or face changes between
  4-neighbours (occlusion boundaries and creases such as cube edges and cylinder rims);
* ``det`` — the tight pixel box of every visible object, left to right; ``caption`` — one sentence about them,
  composed in the grammar of :mod:`.scene_captions` (its words are the shapes, colours and sizes below).

:func:`synthetic_sample` is the deterministic entry point: ``(seed, index, image_size)`` fixes every output bit.
A change to what this module renders must bump prepare-data's ``code_version`` (``fourm_kfp/stages``), so committed
datasets of the old renderer are not reused as if they were new ones. The modalities it draws are the ``synthetic``
source's record's (:mod:`.synthetic_source`), which prepare-data's address covers; ``tests/data/test_sources.py``
checks that they are the same, so a modality drawn here needs its place in the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from fourm_kfp.data import scene_captions as captions
from fourm_kfp.data.modalities import CLASS_NAMES, format_det

#: Albedo (linear RGB in 0..1) of each colour word (``captions.COLOR_WORDS``, in order).
COLOR_ALBEDO: dict[str, tuple[float, float, float]] = dict(zip(captions.COLOR_WORDS, (
    (0.85, 0.12, 0.10), (0.15, 0.65, 0.20), (0.12, 0.28, 0.85),  # red, green, blue
    (0.92, 0.80, 0.12), (0.55, 0.22, 0.75), (0.12, 0.75, 0.80),  # yellow, purple, cyan
    (0.95, 0.48, 0.08), (0.92, 0.92, 0.92), (0.45, 0.45, 0.47),  # orange, white, gray
), strict=True))
#: Radius (sphere, cylinder, cone) or half-extent (cube) in metres of each size word (``captions.SIZE_WORDS``).
SIZE_RADIUS: dict[str, float] = dict(zip(captions.SIZE_WORDS, (0.35, 0.5, 0.7), strict=True))  # small, medium, large
GROUND_RADIUS = 25.0  # metres; beyond it a ray sees sky, which keeps every depth well below MAX_DEPTH_M
GROUND_ALBEDO = np.array([0.62, 0.56, 0.45])
SKY_HORIZON, SKY_ZENITH = np.array([0.85, 0.89, 0.94]), np.array([0.40, 0.58, 0.86])
_EPS = 1e-6  # smallest accepted ray parameter
_SHADOW_OFFSET = 1e-4  # shadow rays start this far off the surface, along the normal


@dataclass(frozen=True)
class SceneObject:
    """A primitive resting on the ground.

    ``center`` is the world centre of its bounding box (so ``center[1] == height / 2``); ``radius`` is the
    sphere/cylinder/cone (base) radius or the cube half-extent; ``yaw`` turns a cube about the vertical axis.
    """

    shape: str
    color: str
    size: str
    center: np.ndarray
    radius: float
    height: float
    yaw: float = 0.0

    @property
    def footprint(self) -> float:
        """Radius of a vertical cylinder around the object: disjoint footprints never interpenetrate."""
        return self.radius * np.sqrt(2.0) if self.shape == "cube" else self.radius


@dataclass(frozen=True)
class Camera:
    """A pinhole camera; its frame has x right, y up and z towards the viewer (it looks along -z)."""

    position: np.ndarray
    look_at: np.ndarray
    fov_deg: float  # horizontal = vertical field of view (images are square)

    @cached_property
    def rotation(self) -> np.ndarray:
        """The 3x3 world→camera rotation; its rows are the camera's right, up and backward axes in world."""
        back = self.position - self.look_at
        back = back / np.linalg.norm(back)
        right = np.cross([0.0, 1.0, 0.0], back)
        right = right / np.linalg.norm(right)
        return np.stack([right, np.cross(back, right), back])

    def world_to_camera(self, points: np.ndarray) -> np.ndarray:
        """World points ``[..., 3]`` → camera-frame points (visible points have negative z)."""
        return (np.asarray(points) - self.position) @ self.rotation.T

    def camera_to_world(self, points: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`world_to_camera`."""
        return np.asarray(points) @ self.rotation + self.position

    def intrinsics(self, image_size: int) -> tuple[float, float, float, float]:
        """``(fx, fy, cx, cy)`` in pixels for a square image: pixel ``(row, col)`` has its centre at
        ``(col + 0.5, row + 0.5)`` and sees camera point ``z * ((u - cx) / fx, -(v - cy) / fy, -1)``."""
        f = image_size / 2.0 / np.tan(np.radians(self.fov_deg) / 2.0)
        return f, f, image_size / 2.0, image_size / 2.0


@dataclass(frozen=True)
class Scene:
    """Objects, camera and light; ``caption_variant`` picks among equivalent caption phrasings."""

    objects: tuple[SceneObject, ...]
    camera: Camera
    light_direction: np.ndarray  # unit world vector pointing towards the (directional) light
    caption_variant: int = 0


def sample_scene(rng: np.random.Generator) -> Scene:
    """A random scene: 1–4 non-interpenetrating objects on the ground, each bounding box inside the view."""
    azimuth = rng.uniform(0.0, 2.0 * np.pi)
    distance, height = rng.uniform(3.8, 5.5), rng.uniform(1.8, 3.0)
    look_at = np.array([rng.uniform(-0.3, 0.3), 0.4, rng.uniform(-0.3, 0.3)])
    position = look_at * [1, 0, 1] + [distance * np.sin(azimuth), height, distance * np.cos(azimuth)]
    camera = Camera(position, look_at, float(rng.uniform(45.0, 55.0)))
    half_view = np.tan(np.radians(camera.fov_deg) / 2.0)
    corners = np.array(np.meshgrid([-1, 1], [-1, 1], [-1, 1])).reshape(3, -1).T  # of the bounding box

    objects: list[SceneObject] = []
    for _ in range(rng.integers(1, 5)):
        shape = rng.choice(captions.SHAPE_WORDS)
        color, size = rng.choice(captions.COLOR_WORDS), rng.choice(captions.SIZE_WORDS)
        radius = SIZE_RADIUS[size]
        obj_height = 2.0 * radius if shape in ("sphere", "cube") else radius * rng.uniform(1.6, 3.0)
        yaw = float(rng.uniform(0.0, np.pi / 2.0)) if shape == "cube" else 0.0
        for _attempt in range(50):  # rejection sampling of the position; the object is dropped if none fits
            xz = look_at[[0, 2]] + rng.uniform(-1.8, 1.8, size=2)
            obj = SceneObject(str(shape), str(color), str(size), np.array([xz[0], obj_height / 2, xz[1]]),
                              radius, float(obj_height), yaw)
            cam = camera.world_to_camera(obj.center + corners * [obj.footprint, obj_height / 2, obj.footprint])
            in_view = np.all(cam[:, 2] < 0.0) and np.all(np.abs(cam[:, :2] / -cam[:, 2:]) < 0.95 * half_view)
            apart = all(np.linalg.norm((obj.center - o.center)[[0, 2]]) > obj.footprint + o.footprint + 0.05
                        for o in objects)
            if in_view and apart:
                objects.append(obj)
                break

    elevation, light_azimuth = rng.uniform(np.radians(35), np.radians(65)), rng.uniform(0.0, 2.0 * np.pi)
    light = np.array([np.cos(elevation) * np.sin(light_azimuth), np.sin(elevation),
                      np.cos(elevation) * np.cos(light_azimuth)])
    return Scene(tuple(objects), camera, light, int(rng.integers(0, 6)))


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Dot products of the vectors of two broadcastable ``[3, N]`` arrays."""
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _finite(t: np.ndarray) -> np.ndarray:
    """``t`` with misses (inf) set to 0, for computing hit points that are then thrown away."""
    return np.where(np.isfinite(t), t, 0.0)


def _quadric_hits(a, b, c, o_y, d_y, y_max) -> np.ndarray:
    """Nearest root ``t > _EPS`` of ``a t² + b t + c = 0`` whose hit height lies in ``[0, y_max]`` (inf if none)."""
    disc = b * b - 4.0 * a * c
    ok = (disc >= 0.0) & (np.abs(a) > 1e-12)
    sq, denom = np.sqrt(np.where(ok, disc, 0.0)), np.where(ok, 2.0 * a, 1.0)
    best = np.full(disc.shape, np.inf)
    for t in ((-b + sq) / denom, (-b - sq) / denom):  # whichever is smaller wins the last np.minimum
        y = o_y + t * d_y
        best = np.minimum(best, np.where(ok & (t > _EPS) & (y >= 0.0) & (y <= y_max), t, np.inf))
    return best


def _intersect(obj: SceneObject, origins: np.ndarray, dirs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rays against one object → ray parameter ``[N]`` (inf = miss), world normal ``[3, N]``, face id ``[N]``.

    Vectors are component-major ``[3, N]`` arrays (fast in NumPy); ``origins`` or ``dirs`` may be one ``[3, 1]``
    vector shared by all rays. Only rays that pass the object's bounding sphere are intersected exactly.
    """
    n = np.broadcast_shapes(origins.shape, dirs.shape)[1]
    t, normal, face = np.full(n, np.inf), np.zeros((3, n)), np.zeros(n, dtype=np.int64)
    to_centre, radius2 = obj.center[:, None] - origins, obj.footprint**2 + (obj.height / 2.0) ** 2 + 1e-9
    along, length2 = _dot(to_centre, dirs), _dot(dirs, dirs)
    miss2 = _dot(to_centre, to_centre) - along**2 / length2  # squared distance of the centre from the ray's line
    near = np.flatnonzero((miss2 <= radius2) & (along > -np.sqrt(radius2 * length2)))  # and not wholly behind
    subset = [v if v.shape[1] == 1 else v[:, near] for v in (origins, dirs)]
    t[near], normal[:, near], face[near] = _intersect_exactly(obj, *subset)
    return t, normal, face


def _intersect_exactly(obj: SceneObject, origins: np.ndarray, dirs: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`_intersect` without the bounding-sphere test."""
    cos, sin = np.cos(obj.yaw), np.sin(obj.yaw)
    rot = np.array([[cos, 0.0, sin], [0.0, 1.0, 0.0], [-sin, 0.0, cos]])  # object→world, about the vertical
    o = rot.T @ (origins - obj.center[:, None] * [[1], [0], [1]])  # object frame: origin at the base's centre
    d = rot.T @ dirs
    r, h = obj.radius, obj.height
    face = np.zeros(np.broadcast_shapes(o.shape, d.shape)[1], dtype=np.int64)
    if obj.shape == "sphere":
        oc = o - [[0.0], [r], [0.0]]
        t = _quadric_hits(_dot(d, d), 2.0 * _dot(oc, d), _dot(oc, oc) - r * r, o[1], d[1], h)
        normal = (oc + _finite(t) * d) / r
    elif obj.shape == "cube":
        with np.errstate(divide="ignore", invalid="ignore"):
            t0, t1 = (-r - (o - [[0.0], [r], [0.0]])) / d, (r - (o - [[0.0], [r], [0.0]])) / d
        near, far = np.minimum(t0, t1), np.maximum(t0, t1)
        axis, rays = np.argmax(near, axis=0), np.arange(len(face))
        t = np.max(near, axis=0)
        t = np.where((t <= np.min(far, axis=0)) & (t > _EPS), t, np.inf)
        sign = -np.sign(np.broadcast_to(d, near.shape)[axis, rays])
        normal = np.zeros(near.shape)
        normal[axis, rays] = sign
        face = 2 * axis + (sign > 0)
    else:  # vertical cylinder or cone with its base on the ground; the base disc is never visible
        k2 = (r / h) ** 2 if obj.shape == "cone" else 0.0
        apex = h - o[1]  # cone: radius at height y is k (h - y)
        a = d[0] ** 2 + d[2] ** 2 - k2 * d[1] ** 2
        b = 2.0 * (o[0] * d[0] + o[2] * d[2] + k2 * apex * d[1])
        c = o[0] ** 2 + o[2] ** 2 - (k2 * apex**2 if obj.shape == "cone" else r * r)
        t = _quadric_hits(a, b, c, o[1], d[1], h)
        p = o + _finite(t) * d
        rho = np.maximum(np.hypot(p[0], p[2]), 1e-12)
        normal = np.stack([p[0] / rho, np.full_like(rho, np.sqrt(k2)), p[2] / rho]) / np.sqrt(1.0 + k2)
        if obj.shape == "cylinder":  # the top cap
            with np.errstate(divide="ignore", invalid="ignore"):
                t_cap = (h - o[1]) / d[1]
            q = o + _finite(t_cap) * d
            cap = (t_cap > _EPS) & (q[0] ** 2 + q[2] ** 2 <= r * r) & (t_cap < t)
            t = np.where(cap, t_cap, t)
            normal = np.where(cap, [[0.0], [1.0], [0.0]], normal)
            face = cap.astype(np.int64)
    return t, rot @ normal, face


def _cast(scene: Scene, origin: np.ndarray, dirs: np.ndarray) -> tuple[np.ndarray, ...]:
    """First hit of rays from ``origin [3, 1]`` along ``dirs [3, N]``: ray parameter (inf = sky), world normal
    ``[3, N]``, instance id (0 sky, 1 ground, 2 + object index) and face id."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(dirs[1] < 0.0, -origin[1] / dirs[1], np.inf)
    hit = origin + _finite(t) * dirs
    t = np.where(np.hypot(hit[0], hit[2]) < GROUND_RADIUS, t, np.inf)
    normal = np.where(np.isfinite(t), [[0.0], [1.0], [0.0]], 0.0)
    instance = np.isfinite(t).astype(np.int64)
    face = np.zeros(len(t), dtype=np.int64)
    for i, obj in enumerate(scene.objects):
        t_obj, n_obj, f_obj = _intersect(obj, origin, dirs)
        closer = t_obj < t
        t, instance = np.where(closer, t_obj, t), np.where(closer, i + 2, instance)
        normal, face = np.where(closer, n_obj, normal), np.where(closer, f_obj, face)
    return t, normal, instance, face


def _shade(scene: Scene, view: np.ndarray, points: np.ndarray, distance: np.ndarray, normal: np.ndarray,
           instance: np.ndarray) -> np.ndarray:
    """Linear RGB ``[3, N]`` of rays along unit ``view`` directions that hit ``points`` at ``distance``: a sky
    gradient, or albedo × (ambient + unshadowed diffuse) + specular, fading towards the horizon colour."""
    light = scene.light_direction[:, None]
    albedos = np.array([[0.0] * 3, GROUND_ALBEDO] + [COLOR_ALBEDO[o.color] for o in scene.objects])
    albedo = albedos[instance].T
    checker = (np.floor(points[0]) + np.floor(points[2])) % 2.0
    fade = np.clip(distance / (GROUND_RADIUS + 10.0), 0.0, 1.0)
    albedo = np.where(instance == 1, albedo * (1.0 - 0.18 * checker * (1.0 - fade)), albedo)

    lit = np.clip(_dot(normal, light), 0.0, None)
    solid = np.flatnonzero((instance > 0) & (lit > 0.0))
    shadow_origins = points[:, solid] + _SHADOW_OFFSET * normal[:, solid]
    blocked = np.zeros(len(solid), dtype=bool)
    for obj in scene.objects:
        blocked |= np.isfinite(_intersect(obj, shadow_origins, light)[0])
    lit[solid[blocked]] = 0.0

    half = light - view
    half /= np.sqrt(_dot(half, half))
    specular = np.where((instance > 1) & (lit > 0.0), 0.25 * np.clip(_dot(normal, half), 0.0, 1.0) ** 40, 0.0)
    color = albedo * (0.35 + 0.75 * lit) + specular
    up = np.clip(view[1], 0.0, 1.0) ** 0.6
    sky = SKY_HORIZON[:, None] + (SKY_ZENITH - SKY_HORIZON)[:, None] * up
    return np.where(instance == 0, sky, color + 0.6 * fade**2 * (SKY_HORIZON[:, None] - color))


def _edges(labels: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """1 where the surface label changes between 4-neighbours, on the nearer pixel of each differing pair."""
    near = np.where(depth > 0.0, depth, np.inf)
    edge = np.zeros(labels.shape, dtype=np.uint8)
    for axis in (0, 1):
        a, b = [slice(None)] * 2, [slice(None)] * 2
        a[axis], b[axis] = slice(None, -1), slice(1, None)
        differ = labels[tuple(a)] != labels[tuple(b)]
        first_nearer = near[tuple(a)] <= near[tuple(b)]
        edge[tuple(a)] |= differ & first_nearer
        edge[tuple(b)] |= differ & ~first_nearer
    return edge


def _named(obj: SceneObject) -> str:
    return captions.object_phrase(obj.size, obj.color, obj.shape)


def _caption(scene: Scene, visible: list[tuple[SceneObject, float]], image_size: int) -> str:
    """One sentence about the visible ``(object, mask centroid x)`` pairs, sorted left to right: what it says is
    decided here (which objects, which is nearer, where each sits), how it is said in :mod:`.scene_captions`."""
    if not visible:
        return captions.EMPTY_SCENE
    v = scene.caption_variant
    (a, xa), rest = visible[0], visible[1:]
    if not rest:
        return captions.single_object(_named(a), captions.horizontal_place(xa, image_size), v)
    (b, xb), extra = rest[0], rest[1:]
    za, zb = -scene.camera.world_to_camera(np.stack([a.center, b.center]))[:, 2]
    if abs(za - zb) > 0.3 and abs(xa - xb) < 0.15 * image_size:  # one above the other in the image
        near, far = (a, b) if za < zb else (b, a)
        sentence = captions.in_depth(_named(near), _named(far), v)
    else:
        sentence = captions.side_by_side(_named(a), _named(b), v)
    return captions.with_others(sentence, [captions.placed(_named(o), captions.horizontal_place(x, image_size))
                                           for o, x in extra])


def render_scene(scene: Scene, image_size: int, return_instances: bool = False) -> dict[str, Any]:
    """Ray-cast ``scene`` into a square ``image_size`` image of every modality (see the module docstring).

    With ``return_instances`` the dict also holds ``"instance"``: int64 ``[H, W]`` (0 sky, 1 ground,
    ``2 + i`` for ``scene.objects[i]``) — the masks ``det``, ``caption`` and ``edge`` are derived from.
    """
    cam = scene.camera
    fx, fy, cx, cy = cam.intrinsics(image_size)
    centres = np.arange(image_size) + 0.5
    u, v = np.meshgrid((centres - cx) / fx, -(centres - cy) / fy)
    # World ray directions [3, N] whose camera z-component is -1, so that the ray parameter is the z-depth.
    dirs = cam.rotation.T @ np.stack([u.ravel(), v.ravel(), -np.ones(u.size)])
    origin = cam.position[:, None]
    t, normal, instance, face = _cast(scene, origin, dirs)
    t = np.where(instance > 0, t, 0.0)
    length = np.sqrt(_dot(dirs, dirs))
    rgb = _shade(scene, dirs / length, origin + t * dirs, t * length, normal, instance)

    shape2d = (image_size, image_size)
    depth = t.reshape(shape2d)
    instance = instance.reshape(shape2d)
    class_ids = np.array([0, 1] + [CLASS_NAMES.index(o.shape) for o in scene.objects], dtype=np.uint8)
    min_pixels = max(4, round(2e-3 * image_size**2))
    visible, boxes = [], []
    for i, obj in enumerate(scene.objects):
        rows, cols = np.nonzero(instance == i + 2)
        if len(rows) >= min_pixels:
            boxes.append(((cols.min(), rows.min(), cols.max() + 1, rows.max() + 1), obj.shape))
            visible.append((obj, float(cols.mean() + 0.5)))
    order = sorted(range(len(boxes)), key=lambda j: boxes[j][0][:2])
    sample = {
        "rgb": (np.clip(rgb.T, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8).reshape(*shape2d, 3),
        "depth": depth.astype(np.float32),
        "normal": (cam.rotation @ normal).T.astype(np.float32).reshape(*shape2d, 3),
        "semseg": class_ids[instance],
        "edge": _edges(instance * 8 + face.reshape(shape2d), depth),
        "det": format_det([boxes[j][0] for j in order], [boxes[j][1] for j in order], image_size, image_size),
        "caption": _caption(scene, sorted(visible, key=lambda ox: ox[1]), image_size),
    }
    if return_instances:
        sample["instance"] = instance
    return sample


def synthetic_sample(seed: int, index: int, image_size: int) -> dict[str, Any]:
    """Scene ``index`` of the synthetic dataset ``seed``, rendered at ``image_size``; bit-identical on every call."""
    return render_scene(sample_scene(np.random.default_rng([seed, index])), image_size)
