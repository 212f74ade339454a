"""facebookresearch/dino (commit 7c446df), transcribed: the independent references that tests, ``make bench`` and
``make gpu-check`` compare the project with. Nothing here imports the project.

vit.py        vision_transformer.py (the ViT, DINOHead) and utils.py (MultiCropWrapper, schedules, clipping)
main_dino.py  main_dino.py: DINOLoss, the student/teacher build and one train_one_epoch iteration
eval_knn.py   eval_knn.py: knn_classifier (the weighted k-NN vote)
"""
