"""Text the demo tokenizer is trained on: radiology vocabulary, so demo output reads as (meaningless) words."""

RADIOLOGY_CORPUS = (
    """
Findings: The lungs are clear without focal consolidation, pleural effusion, or pneumothorax.
The cardiomediastinal silhouette is within normal limits. The heart size is normal.
There is a right lower lobe opacity concerning for pneumonia. Small left pleural effusion.
No acute osseous abnormality. Degenerative changes of the thoracic spine.
Impression: No acute cardiopulmonary process. Findings suggest early pulmonary edema.
Endotracheal tube terminates 4 cm above the carina. Nasogastric tube courses below the diaphragm.
Central venous catheter tip projects over the superior vena cava. Cardiomegaly with vascular congestion.
Hyperinflated lungs with flattened hemidiaphragms, consistent with emphysema. Apical pleural thickening.
Reticular interstitial opacities at the bases. Hilar lymphadenopathy. Mediastinal widening.
Atelectasis at the left base. Costophrenic angles are sharp. Trachea is midline.
Calcified granuloma in the right upper lobe. Pulmonary nodule measuring 8 mm. Mass in the left hilum.
Rib fracture on the right. Subcutaneous emphysema. Free air under the diaphragm. Aortic knob calcification.
PA view, posteroanterior, lateral, AP portable, supine, upright, inspiration, rotation, penetration.
What are the main findings? Is there a pneumothorax? Describe the heart size. Is the film adequate?
Compare the two lungs. Where is the abnormality? What is the differential diagnosis?
Which lobe is involved? Is there any line or tube? Write a structured report with findings and impression.
You are an expert radiologist. Answer concisely for teaching rounds.
"""
    * 3
)
