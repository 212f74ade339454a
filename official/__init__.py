"""facebookresearch/dino (commit 7c446df), transcribed: the independent references that tests, ``make bench`` and
``make gpu-check`` compare the project with. Nothing here imports the project.

vit.py        vision_transformer.py (the ViT, DINOHead) and utils.py (MultiCropWrapper, schedules, clipping)
main_dino.py  main_dino.py: DINOLoss, the student/teacher build and one train_one_epoch iteration
eval_knn.py   eval_knn.py: knn_classifier (the weighted k-NN vote)

Other projects' models, each file naming its repository and commit (the references of the foreign-checkpoint tests):
dinov2.py     facebookresearch/dinov2: DinoVisionTransformer's forward, the hub's per-model settings
deit.py       facebookresearch/deit models.py on timm 0.3.2's VisionTransformer; the fine-tuning table resampling
mae.py        facebookresearch/mae models_vit.py (global_pool, fc_norm)
leopart.py    MkuuWaUjinga/leopart (and vpariza/NeCo): the overclustering evaluation
hummingbird.py  vpariza/open-hummingbird-eval: the retrieval memory's training view

Statistics (the references of tests/test_study_stats.py):
r_ttest.py    R's t.test on R's sleep and mtcars data sets, the figures R prints
rliable.py    google-research/rliable: probability_of_improvement, the stratified independent bootstrap
"""
