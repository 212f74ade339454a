"""Built-in demo data: synthetic scenes generated on first use, deterministic, in seconds, no download.

Objects of 8 classes (each class has its own shape, colour and texture) on cluttered backgrounds, written in the
real on-disk layouts so the real loaders read them:

    <root>/imagefolder/{train,val}/<class>/*.png             64x64 RGB, one object  (pretraining, k-NN, linear)
    <root>/VOCdevkit/VOC2012/JPEGImages/*.jpg                128x128 multi-object scenes (segmentation, boxes)
                             SegmentationClass/*.png         palette PNG, 0 background, 1..8 classes, 255 borders
                             SegmentationObject/*.png        palette PNG, instance ids, 255 borders
                             Annotations/*.xml               VOC XML, 1-based inclusive pixel boxes
                             ImageSets/Segmentation/{train,val,trainval}.txt
    <root>/nyu/{images,annotations}/{train,test}/*.{jpg,png} 160x120 room scenes, 16-bit depth PNG in mm (0.5..10 m)
    <root>/classes.json                                      class names, palette, counts, layouts
    <root>/.demo_complete.json                               marker, written last (version, spec hash, digest)

Three jobs, three modules: ``scenes`` draws (class table, shapes, textures, backgrounds, one sample of each
layout), ``layouts`` writes them in the on-disk formats (``DemoSpec``: sizes and counts), ``cache`` keeps the
folder (``ensure_demo_data``: generate on first use, atomic swap, completion marker; the CLI).

>>> root = ensure_demo_data()            # data/demo (env TOKENMIX_DEMO_ROOT), generated if missing or stale

``is_demo(name)`` (``names``) is the one rule for "is this DATA value / dataset the demo data".
"""
from .cache import MARKER, ensure_demo_data, generate, is_complete, main, summary
from .layouts import DEMO_VERSION, DemoSpec, seg_palette
from .names import DEMO, DEMO_DATASETS, demo_dataset, is_demo
from .scenes import CLASS_NAMES, CLASSES, IGNORE_INDEX, NYU_SCENE, SEG_CLASSES

__all__ = ["CLASSES", "CLASS_NAMES", "DEMO", "DEMO_DATASETS", "DEMO_VERSION", "DemoSpec", "IGNORE_INDEX", "MARKER",
           "NYU_SCENE", "SEG_CLASSES", "demo_dataset", "ensure_demo_data", "generate", "is_complete", "is_demo", "main",
           "seg_palette", "summary"]
