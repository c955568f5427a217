"""Synthetic scenes: determinism, formats, and exact alignment of every modality with the scene geometry."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fourm_kfp.data.modalities import CLASS_NAMES, COORD_BINS, OBJECT_CLASSES, parse_det
from fourm_kfp.data.scene_captions import COLOR_WORDS, SIZE_WORDS
from fourm_kfp.data.synthetic_scenes import Camera, Scene, SceneObject, render_scene, sample_scene, synthetic_sample

UP = np.array([0.0, 1.0, 0.0])


def _object(shape: str, x: float, z: float, radius: float, height: float, yaw: float = 0.0) -> SceneObject:
    return SceneObject(shape, "red", "medium", np.array([x, height / 2, z]), radius, height, yaw)


#: One object of every shape in view, lit from the side so that some of the ground is in shadow.
SCENE = Scene(
    objects=(
        _object("sphere", -1.2, 0.5, 0.5, 1.0),
        _object("cube", 1.2, 0.3, 0.5, 1.0, yaw=0.5),
        _object("cylinder", 0.0, -1.0, 0.4, 1.4),
        _object("cone", -0.2, 1.5, 0.45, 1.2),
    ),
    camera=Camera(np.array([0.5, 2.5, 6.0]), np.array([0.0, 0.5, 0.0]), 50.0),
    light_direction=np.array([0.4, 0.8, 0.45]) / np.linalg.norm([0.4, 0.8, 0.45]),
)


def _world_points(scene: Scene, depth: np.ndarray) -> np.ndarray:
    """Back-project every pixel centre at its depth to a world point ``[H, W, 3]`` (via the public intrinsics)."""
    size = depth.shape[0]
    fx, fy, cx, cy = scene.camera.intrinsics(size)
    centres = np.arange(size) + 0.5
    u, v = np.meshgrid((centres - cx) / fx, -(centres - cy) / fy)
    camera_points = depth.astype(np.float64)[..., None] * np.stack([u, v, -np.ones_like(u)], -1)
    return scene.camera.camera_to_world(camera_points)


def _expected_surface(obj: SceneObject, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For world points ``p [N, 3]`` on ``obj``: the distance off its surface and its analytic world normal."""
    cos, sin = np.cos(obj.yaw), np.sin(obj.yaw)
    dx, y, dz = (p - obj.center * [1, 0, 1]).T
    x, z = cos * dx - sin * dz, sin * dx + cos * dz  # object frame (yaw undone)
    r, h = obj.radius, obj.height
    if obj.shape == "sphere":
        offset = p - obj.center
        return np.abs(np.linalg.norm(offset, axis=1) - r), offset / r
    if obj.shape == "cube":
        q = np.stack([x, y - r, z], 1)
        axis = np.argmax(np.abs(q), axis=1)
        local = np.zeros_like(q)
        local[np.arange(len(q)), axis] = np.sign(q[np.arange(len(q)), axis])
        residual = np.abs(np.max(np.abs(q), axis=1) - r)
    else:
        rho = np.hypot(x, z)
        if obj.shape == "cylinder":
            cap = np.abs(y - h) < np.abs(rho - r)
            residual = np.where(cap, np.abs(y - h), np.abs(rho - r))
            local = np.where(cap[:, None], UP, np.stack([x / rho, 0 * rho, z / rho], 1))
        else:
            k = r / h
            residual = np.abs(rho - k * (h - y))
            local = np.stack([x / rho, np.full_like(rho, k), z / rho], 1) / np.sqrt(1 + k * k)
    world = np.stack([cos * local[:, 0] + sin * local[:, 2], local[:, 1], -sin * local[:, 0] + cos * local[:, 2]], 1)
    return residual, world


def test_same_arguments_give_bit_identical_samples_and_other_indices_differ():
    first, again, other = synthetic_sample(3, 7, 32), synthetic_sample(3, 7, 32), synthetic_sample(3, 8, 32)
    assert first.keys() == again.keys() == {"rgb", "depth", "normal", "semseg", "edge", "det", "caption"}
    for name in first:
        if isinstance(first[name], str):
            assert first[name] == again[name]
        else:
            assert first[name].tobytes() == again[name].tobytes(), name
    assert first["rgb"].tobytes() != other["rgb"].tobytes()
    assert synthetic_sample(4, 7, 32)["depth"].tobytes() != first["depth"].tobytes()


def test_every_modality_has_the_documented_dtype_and_shape():
    sample = synthetic_sample(0, 1, 48)
    expected = {
        "rgb": (np.uint8, (48, 48, 3)), "depth": (np.float32, (48, 48)), "normal": (np.float32, (48, 48, 3)),
        "semseg": (np.uint8, (48, 48)), "edge": (np.uint8, (48, 48)),
    }
    for name, (dtype, shape) in expected.items():
        assert sample[name].dtype == dtype and sample[name].shape == shape, name
    assert isinstance(sample["det"], str) and isinstance(sample["caption"], str)
    assert set(np.unique(sample["edge"])) <= {0, 1}
    assert sample["semseg"].max() < len(CLASS_NAMES)
    valid = sample["depth"] > 0
    assert np.allclose(np.linalg.norm(sample["normal"][valid], axis=-1), 1.0, atol=1e-5)


def test_sampled_scenes_rest_on_the_ground_without_interpenetrating():
    for index in range(40):
        scene = sample_scene(np.random.default_rng([0, index]))
        assert 1 <= len(scene.objects) <= 4
        for obj in scene.objects:
            assert obj.center[1] == pytest.approx(obj.height / 2)
            assert obj.shape in OBJECT_CLASSES and obj.color in COLOR_WORDS and obj.size in SIZE_WORDS
        for a, b in itertools.combinations(scene.objects, 2):
            assert np.hypot(*(a.center - b.center)[[0, 2]]) > a.footprint + b.footprint


@pytest.mark.parametrize("shape", ["sphere", "cube", "cylinder", "cone"])
def test_object_pixels_back_project_onto_the_object_surface_with_its_analytic_normal(shape):
    sample = render_scene(SCENE, 64, return_instances=True)
    index = next(i for i, o in enumerate(SCENE.objects) if o.shape == shape)
    mask = sample["instance"] == index + 2
    assert mask.sum() > 20
    assert np.all(sample["semseg"][mask] == CLASS_NAMES.index(shape))
    points = _world_points(SCENE, sample["depth"])[mask]
    residual, normal = _expected_surface(SCENE.objects[index], points)
    assert residual.max() < 1e-3 * SCENE.objects[index].radius
    expected = normal @ SCENE.camera.rotation.T  # world → camera frame
    assert np.abs(sample["normal"][mask] - expected).max() < 1e-3
    assert np.all(np.sum(normal * (SCENE.camera.position - points), axis=1) > 0)  # seen from outside


def test_ground_and_sky_pixels_are_exact():
    for scene in [SCENE] + [sample_scene(np.random.default_rng([5, i])) for i in range(5)]:
        sample = render_scene(scene, 48)
        ground, sky = sample["semseg"] == 1, sample["semseg"] == 0
        assert ground.any() and (sky.any() or scene is not SCENE)  # a close camera may not see the horizon
        assert np.abs(_world_points(scene, sample["depth"])[ground][:, 1]).max() < 1e-3
        assert np.abs(sample["normal"][ground] - scene.camera.rotation @ UP).max() < 1e-5
        assert np.all(sample["depth"][sky] == 0) and np.all(sample["normal"][sky] == 0)
        assert np.all(sample["depth"][~sky] > 0)


def test_the_sphere_casts_a_shadow_on_the_ground():
    sample = render_scene(SCENE, 64)
    ground = sample["semseg"] == 1
    points = _world_points(SCENE, sample["depth"])[ground]
    sphere = SCENE.objects[0]
    to_centre = sphere.center - points
    along = to_centre @ SCENE.light_direction
    miss = np.sqrt(np.maximum(np.sum(to_centre**2, axis=1) - along**2, 0.0))
    brightness = sample["rgb"][ground].astype(float).mean(axis=1)
    shadowed = (along > 0) & (miss < 0.9 * sphere.radius)
    assert shadowed.sum() > 10
    assert brightness[shadowed].max() < 0.8 * np.median(brightness[~shadowed])


def test_sampled_sphere_pixels_are_exact():
    checked = 0
    for index in range(30):
        scene = sample_scene(np.random.default_rng([1, index]))
        sample = render_scene(scene, 32, return_instances=True)
        points = _world_points(scene, sample["depth"])
        for i, obj in enumerate(scene.objects):
            mask = sample["instance"] == i + 2
            if obj.shape == "sphere" and mask.any():
                residual, normal = _expected_surface(obj, points[mask])
                assert residual.max() < 1e-3 * obj.radius
                assert np.abs(sample["normal"][mask] - normal @ scene.camera.rotation.T).max() < 1e-3
                checked += 1
    assert checked > 5


def test_det_boxes_are_the_tight_boxes_of_the_visible_instances_left_to_right():
    for scene, size in [(SCENE, 64)] + [(sample_scene(np.random.default_rng([2, i])), 48) for i in range(10)]:
        sample = render_scene(scene, size, return_instances=True)
        boxes = parse_det(sample["det"])
        tight = {}
        for i, obj in enumerate(scene.objects):
            rows, cols = np.nonzero(sample["instance"] == i + 2)
            if len(rows):
                edges = (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1)
                tight[i] = (tuple(min(int(v * COORD_BINS // size), COORD_BINS - 1) for v in edges), obj.shape)
        assert all(box in tight.values() for box in boxes)
        assert len(boxes) == len(set(boxes))
        assert [b[0][0] for b in boxes] == sorted(b[0][0] for b in boxes)
        assert all(name in OBJECT_CLASSES for _, name in boxes)
        # Only objects with a handful of visible pixels are left out.
        listed = [i for i, box in tight.items() if box in boxes]
        for i in set(tight) - set(listed):
            assert (sample["instance"] == i + 2).sum() < 0.01 * size * size
    assert len(parse_det(render_scene(SCENE, 64)["det"])) == 4


def test_caption_names_the_shape_and_colour_of_every_visible_object():
    checked = 0
    for index in range(12):
        scene = sample_scene(np.random.default_rng([3, index]))
        sample = render_scene(scene, 48, return_instances=True)
        words = sample["caption"].split()
        assert sample["caption"] == sample["caption"].lower()
        listed = {name for _, name in parse_det(sample["det"])}
        for i, obj in enumerate(scene.objects):
            if obj.shape in listed and (sample["instance"] == i + 2).sum() >= 10:
                assert obj.shape in words and obj.color in words, (sample["caption"], obj)
                checked += 1
    assert checked >= 12


def test_edges_mark_object_ground_boundaries_and_cube_creases():
    sample = render_scene(SCENE, 64, return_instances=True)
    instance, edge, normal = sample["instance"], sample["edge"], sample["normal"]
    for a, b in [(np.s_[:, :-1], np.s_[:, 1:]), (np.s_[:-1, :], np.s_[1:, :])]:
        object_ground = ((instance[a] > 1) & (instance[b] == 1)) | ((instance[a] == 1) & (instance[b] > 1))
        assert object_ground.any()
        assert np.all((edge[a] | edge[b])[object_ground])
        cube = next(i for i, o in enumerate(SCENE.objects) if o.shape == "cube") + 2
        crease = (instance[a] == cube) & (instance[b] == cube) & (np.sum(normal[a] * normal[b], -1) < 0.5)
        assert crease.any() and np.all((edge[a] | edge[b])[crease])
    # Inside a smooth surface (the ground away from everything) there are no edges.
    assert edge[-4:, :].sum() == 0
